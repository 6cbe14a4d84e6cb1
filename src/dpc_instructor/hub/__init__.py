"""A class's JupyterHub: the hub config instructors copy, the spawner that gives each user a cgroup,
and those cgroups (cgroups.py).

Imported by the hub itself (its own environment, src/dpc_setup/hub.sh); the course's tools, whose
environment has no JupyterHub, import only cgroups.py (standard library: dpc_maintainer.needs).

Its files, in the order a user's server starts:
- jupyterhub_config.py: the hub's config for a class on one node (`make classroom-test` runs it);
- spawner.py: CgroupSpawner, each user's server in a cgroup of its own;
- cgroups.py: those cgroups: CPU quota, memory and process limits, removed with what is left.
"""
