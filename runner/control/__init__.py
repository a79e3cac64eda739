"""Process control: the processes the runner starts and how each one ends.

Child processes that die with their parent (`procs`), Ctrl-C and SIGTERM stopping at a step boundary (`stopping`),
the sentinel that acts when a process cannot (`watchdog`, a process of its own), ending a process without waiting
on TensorFlow's teardown (`teardown`), one live owner per run or sweep directory (`claims`), and what a runner
process tells the processes it starts (`contract`), how often progress lines reach an output that is no terminal
(`pace`), which threads run below normal priority (`priority`), and what a trial of a pruning search tells its sweep
(`trial_report`).

Imports: runner.errors, runner.tf_private, runner.config
TensorFlow: in functions
mlflow: only in runner.control.watchdog (it ends a run when the training process cannot)
"""
