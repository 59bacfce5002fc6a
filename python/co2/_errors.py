"""co2.Error: what the C++ client or a shard refused, with its status code."""


class Error(RuntimeError):
    """A co2 call failed.

    Attributes:
        code: the gRPC/absl status code's name, e.g. ``"UNAVAILABLE"``,
            ``"FAILED_PRECONDITION"``, ``"DEADLINE_EXCEEDED"``.
        message: what was wrong, as the client or the shard said it.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
