"""The grader, one file per stage, in the order a run's data flows through them (the command line
that starts a run is src/dpc_instructor/grade.py; over SLURM, src/dpc_instructor/spread.py):

intake.py     what the class handed in, one Student each, read as regular files only
              (find_submissions; the grader's id for a name: grader_id)
run.py        what every job of a run shares (Run) and how many jobs run at once (default_jobs)
template.py   the run's start: the lab in the course gradebook, the template course folder every
              job copies (prepare), then the hidden cases and the reference below
cases.py      hidden cases made outside every kernel, in a sandbox of their own, from the run's seed
              (make_cases), and which test cell judges each (assign_cases)
reference.py  the lab's solution graded once per lab and seed: every student's reference, cached in
              the course (reference); it must pass its own tests, or nobody is graded
repair.py     a student's notebooks with what honest editing breaks put right (repair)
job.py        one student's job: nbgrader's autograde in a sandbox (autograde), tried again while a
              try fails for the grading machine's reason (with_retries, tries), and the outcome made
              the student's status (grade_one)
failures.py   whose failure a try was: the grading machine's (host_failure, busy_timeout) or the
              submission's (why_failed, measured)
record.py     the student's result added to the course gradebook (record) and the run's CSV
              (write_csv)

Each module imports only those above it in this import order: intake, run, failures, repair,
record, job, cases, reference, template (no import circle).
"""
