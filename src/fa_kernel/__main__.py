import sys

from fa_kernel.cli import main

sys.exit(main())
