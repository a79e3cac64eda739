"""Multirun sweeps, in the sweep's own process (each job is a fresh training process of its own).

The Hydra callback that makes one MLflow parent run per sweep and starts every job (`sweep`), the next job's
process started ahead (`spares`), the MLflow server that forks each job's MLflow process and the report's
(`server`), the comparison report and its plots from the child runs and the jobs' own records (`report`: a refused
job leaves no run), each job's run name from its swept values (`run_names`), and Slurm jobs under the submitit
launcher (`slurm`). The search behind hydra/sweeper=optuna: its config (`search_config`, no Optuna), its space
(`search_space`), the study (`search`, whose Hydra plugin shell is `hydra_plugin`, installed as
hydra_plugins.runner_sweeper), its pruning (`pruning`) and its importances and plots (`search_plots`). Jobs side by
side, each on its own CPUs, the next started as any ends (`parallel`, sweep.parallel).

Imports: runner.errors, runner.config, runner.control, runner.tracking, runner.mlflow_process (the store, to read
the child runs back)
TensorFlow: never
mlflow: yes (Optuna: in search and pruning, in the sweep's process only)
"""
