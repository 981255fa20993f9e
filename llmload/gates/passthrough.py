"""The flags a gate hands to Locust unchanged, checked against the ones it sets itself.

`llmload soak`, `search` and `sweep` start Locust runs with flags of their own and append every
flag they do not know. Locust's parser keeps the last copy of a flag, and takes a unique prefix
for the whole name, so a user's `--first-session 0` or `--stage-d 10` would silently replace the
gate's own value in every run it starts. Such a flag is refused before anything starts.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from llmload.errors import InputError
from llmload.plan import PlanFlags


def long_options(command: Iterable[str]) -> list[str]:
    """The long options in a command line (`--name` or `--name=value`), without their values."""
    return [token.split("=", 1)[0] for token in command if token.startswith("--") and len(token) > 2]


def refuse_overrides(own: Collection[str], passthrough: Iterable[str], setter: str) -> None:
    """InputError naming the first long option in `passthrough` that is, or abbreviates, one of `own`
    (the names of the flags `setter` gives every run)."""
    for given in long_options(passthrough):
        clash = sorted(name for name in own if name.startswith(given))
        if clash:
            what = given if clash == [given] else f"{given} abbreviates {' or '.join(clash)}, which"
            verb = "is" if len(clash) == 1 else "are"
            raise InputError(
                f"{what} {verb} set by {setter} for every run it starts: remove it (flags llmload does not know "
                "go to Locust after its own, and Locust keeps the last copy)"
            )


def refuse_closed_loop(passthrough: Iterable[str], setter: str) -> None:
    """InputError for --sessions-in-flight under a gate that searches for a rate: a closed loop asks for none."""
    flag = PlanFlags.option("sessions_in_flight")
    if any(flag.startswith(given) and len(given) > 4 for given in long_options(passthrough)):
        raise InputError(
            f"{flag} replays a closed loop, which asks for no rate: {setter} has none to find (soak it instead)"
        )
