"""HostParams: the model's parameters as views of one flat float32 tensor, and
that tensor's host copy, which the C++ client reads Δ from and writes the
anchor into.

On CPU the flat tensor is the host copy: the client works on the parameters'
own storage and nothing is copied. On CUDA the host copy is a pinned mirror;
a gather is one device-to-host copy and a scatter one host-to-device copy, on
a stream of their own, ordered after the training stream's work and before
its next.
"""

from __future__ import annotations

from typing import List, Optional

import torch


class HostParams:
    """Rebinds ``params`` (all float32, on one device) to views of one flat
    tensor, ``flat``, in order. Code that holds a parameter keeps working; a
    tensor taken from ``p.data`` before this no longer aliases it."""

    def __init__(self, params: List[torch.Tensor]) -> None:
        self.numel = sum(p.numel() for p in params)
        self.device = params[0].device
        self._cuda = self.device.type == "cuda"
        self.flat = torch.empty(self.numel, dtype=torch.float32, device=self.device)
        offset = 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                view = self.flat[offset:offset + n].view_as(p)
                view.copy_(p)
                p.data = view
                offset += n
        self._buffer: Optional[torch.Tensor] = None if self._cuda else self.flat
        self._stream: Optional[torch.cuda.Stream] = None

    @property
    def buffer(self) -> torch.Tensor:
        """The host copy (pinned on CUDA, made at first use: only the ranks
        that talk to the shards need one)."""
        if self._buffer is None:
            self._buffer = torch.empty(self.numel, dtype=torch.float32, pin_memory=True)
            self._stream = torch.cuda.Stream(device=self.device)
        return self._buffer

    @property
    def address(self) -> int:
        """The host copy's address, for the C++ client."""
        return self.buffer.data_ptr()

    def gather(self) -> None:
        """host copy ← the parameters (returns once it holds them)."""
        if not self._cuda:
            return
        buffer = self.buffer
        assert self._stream is not None
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            buffer.copy_(self.flat, non_blocking=True)
        self._stream.synchronize()

    def scatter(self) -> None:
        """The parameters ← host copy (the training stream waits for the copy)."""
        if not self._cuda:
            return
        buffer = self.buffer
        assert self._stream is not None
        current = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(current)
        with torch.no_grad(), torch.cuda.stream(self._stream):
            self.flat.copy_(buffer, non_blocking=True)
        current.wait_stream(self._stream)
        # The pinned copy is rewritten by the next gather or exchange: the
        # copy out of it must be done by then.
        self._stream.synchronize()
