import sys

from fa_kernel.workbench.cli import main

sys.exit(main())
