"""The course's runtime, shipped to students: the launcher, the worker protocol, quiet output, the sandbox and the self-check.

Nothing here is a lesson: `helpers` (the students' library) re-exports what a chapter calls.

Its files, in the order a run goes through them:
- manifest.py: course.yml, each notebook's facts (ranks, parameters, slow cells), read here only;
- launch.py: starts a worker script on N ranks (torchrun, horovodrun, tf), streams their output, leaves no orphan;
- worker.py: the ranks' side of a launch: start, report, finish (the protocol launch.py reads);
- quiet.py: harmless lines that read like errors, kept out of a student's notebook;
- reaper.py: a guardian that removes what a run made (daemons, accounts) once the run's process is gone;
- notebook.py: a cell's nbgrader metadata, grade id and text;
- sandbox.py: a student's notebook, and every rank it launches, run in a sandbox (bubblewrap);
- cpuwait.py: how long a sandboxed run's threads waited for a CPU (the grader's evidence of a busy machine);
- judge.py: test cells record values; the verdict compares them with the reference's, outside the kernel;
- check.py: the self-check, `make check LAB=...`: a lab run and judged as the grader does.
"""
