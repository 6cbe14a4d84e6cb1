"""A class's JupyterHub: the hub config instructors copy and the spawner that gives each user a cgroup.

Imported only by the hub itself (its own environment, src/dpc_setup/hub.sh): nothing here is
imported by the course's tools, whose environment has no JupyterHub.
"""
