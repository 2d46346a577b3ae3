"""The workbench around the kernels: building them ahead of use (`builds`), timing them against
cuDNN (`bench`), tuning their tile tables (`tune`) and the `fa-kernel` command (`cli` and a
module per command). The kernels and the API never import it."""
