"""Set-up, shipped to students: the environment (setup.sh), system packages (system.sh), the Horovod build
(horovod/build.sh, its log read by buildlog.py) and the SLURM test cluster (cluster.py)."""
