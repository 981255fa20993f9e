"""What ships inside the package, so an installed llmload runs from any directory: the locustfile
every command's Locust runs, and the sample workload, the default --workload (the repository's
loadtests/chat.py and workloads/ lead to these same files)."""

from pathlib import Path

_HERE = Path(__file__).resolve().parent
LOCUSTFILE = _HERE / "locustfile.py"
SAMPLE_WORKLOAD = _HERE / "workloads" / "chat-multiturn.yaml"
WORKLOAD_HELP = f"workload YAML file (default: the packaged sample, {SAMPLE_WORKLOAD})"


def say_if_sample(command: str, workload: str | Path) -> None:
    """A run on the packaged sample says so: the user may not know it chose none."""
    if Path(workload).absolute() == SAMPLE_WORKLOAD:
        print(f"llmload {command}: workload: the packaged sample, {SAMPLE_WORKLOAD}", flush=True)
