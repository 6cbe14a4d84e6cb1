"""Set-up, shipped to students: the environment (setup.sh), system packages (system.sh), the Horovod build and the SLURM test cluster."""
