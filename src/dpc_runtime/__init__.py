"""The course's runtime, shipped to students: the launcher, the worker protocol, quiet output, the sandbox and the self-check.

Nothing here is a lesson: `helpers` (the students' library) re-exports what a chapter calls.
"""
