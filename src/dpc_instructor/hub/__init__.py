"""A class's JupyterHub: the hub config instructors copy, the spawner that gives each user a cgroup,
and those cgroups (cgroups.py).

Imported by the hub itself (its own environment, src/dpc_setup/hub.sh); the course's tools, whose
environment has no JupyterHub, import only cgroups.py (standard library: dpc_maintainer.needs).
"""
