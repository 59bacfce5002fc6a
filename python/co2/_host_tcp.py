"""co2.check_host_tcp: whether this host's TCP settings let one stream fill
the path a job crosses, as co2-train's and co2-aggregator's --link_mbit and
--link_rtt check at start (docs/operations.md, "Long links")."""

import logging
import warnings

from . import _core

_log = logging.getLogger("co2")


class HostTcpWarning(UserWarning):
    """This host's TCP settings cap one stream below the path: its socket
    buffer maxima per round trip are less than the path's rate, or slow
    start restarts after each round's idle compute."""


def check_host_tcp(link_mbit: float, link_rtt: float) -> str:
    """Reads this host's (network namespace's) TCP settings and returns the
    line that says what one stream may move over a path of ``link_mbit``
    Mbit/s and ``link_rtt`` seconds round trip, and what to set where they
    limit it. Warns with ``HostTcpWarning`` then (also when the settings
    cannot be read); logs the line at INFO on the ``co2`` logger otherwise.

    Raises:
        ValueError: a negative rate or round trip, naming it.
    """
    limits, line = _core.describe_host_tcp(float(link_mbit), float(link_rtt))
    if limits:
        warnings.warn(line, HostTcpWarning, stacklevel=2)
    else:
        _log.info("%s", line)
    return line
