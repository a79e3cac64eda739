"""What a sweep needs under Hydra's submitit launcher, where each job is a Slurm job of several tasks."""

import logging
import os

from runner.errors import ConfigError

log = logging.getLogger("runner")


def port_base(base: int, num: int) -> int:
    """Job `num`'s first port: the jobs of a sweep run at once as a Slurm array and may share a node, where the
    same ports would join one job's tasks to another's cluster. Each job gets its own run of SLURM_NTASKS ports."""
    stride = int(os.environ.get("SLURM_NTASKS") or 1)
    port = base + num * stride
    if port + stride - 1 > 65535:  # the job's last port
        raise ConfigError(
            f"cluster.port_base={base}: job #{num} of the sweep would need ports {port}-{port + stride - 1}, "
            "past 65535 (each job of a Slurm sweep takes its own SLURM_NTASKS ports). Pass a lower cluster.port_base."
        )
    return port


class SacctQuiet(logging.Filter):
    """submitit follows Slurm jobs with `sacct`; where Slurm keeps no accounting (no slurmdbd) every poll logs a
    warning, twice. submitit still sees each job end by its result file: say so once instead."""

    said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if "Bypassing sacct error" not in record.getMessage():
            return True
        if not self.said:
            self.said = True
            log.info("Slurm has no accounting here (sacct fails): submitit follows the jobs by their result files")
        return False
