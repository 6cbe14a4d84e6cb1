"""Maintainer and CI tooling, never shipped: notebook tests, committed outputs, `make solutions`, benchmarks run together, soak.

Its files, in the order a notebook's run goes through them:
- notebooks.py: the chapters prepared for the notebook tests (CI parameters injected);
- solutions.py: every course and solution notebook executed, with a report (`make solutions`);
- solutions.sbatch: the same on a GPU node of a SLURM cluster;
- outputs.py: an executed notebook committed without run metadata or this machine's paths;
- numbers.py: measurements typed into prose that no cell printed;
- rhythm.py: how a chapter reads against the rhythm of the tensorflow/docs tutorials;
- collectives.py: the rule that a tensor handed to torch.distributed is made on a device;
- needs.py: every notebook timed, idle and at a student's share of a class hub (its Needs line);
- run_all.py: every benchmark in one run, one table of ratios against goals (`make bench`);
- soak.py: every kind of launch, again and again, on a loaded machine (`make soak`);
- grading.py: grading throughput, at 1 and N jobs (and over SLURM);
- classroom/: a real class on a real JupyterHub, used in a browser, graded, torn down (its own docstring);
- book.py: the course as a website (`make book`).
"""
