"""Set-up, shipped to students: the environment, system packages, Horovod's build and the SLURM test cluster.

Its files, in the order a set-up runs them:
- setup.sh: the virtual environment .venv (run by every make target), which calls the next two;
- system.sh: the system packages beyond Python (bubblewrap, SLURM), from Debian's archive;
- horovod/build.sh: Horovod built from source with the course's patches (horovod/patches/), cached;
- buildlog.py: build.sh's log read: a progress line, the first error and its fix;
- class_env.sh: one course environment for every user of a class node (`make class-env`);
- hub.sh: what a class hub needs beyond the course (`make classroom-test`);
- cluster.py: a two-node SLURM cluster on this machine, for tests and chapter 8.
"""
