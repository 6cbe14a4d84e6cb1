"""The instructor's toolkit, never shipped: labs from solutions, grading, the gradebook, the release, the transfer check.

Its files, in the order a lab goes through them:
- labs.py: the student labs (labs/) generated from solutions/ with nbgrader, with their checks;
- markers.py: nbgrader's answer and hidden-test markers, read in one place;
- transfer.py: how much of each lab's answer a student could paste from the chapters;
- taught.txt: answer lines the course material teaches on purpose, allowed in the release;
- release.py: the student release (`make release`), without answers, hidden tests or grader;
- student_files/: the release's README, Makefile and .gitignore;
- hub/: a class's JupyterHub (its own docstring);
- grade.py: the grader's command line (`make grade`): a class's submissions of one lab;
- grading/: the grader by stage (its own docstring);
- nbgrader_hooks.py: what the grader changes in nbgrader's autograde;
- spread.py: grading spread over a SLURM cluster (`make grade SLURM=1`);
- gradebook.py: the course's one gradebook: export and feedback (`make grades`, `make feedback`);
- report.py: the instructor's report on the gradebook (`make report`).
"""
