"""HostParams: the model's parameters as views of one flat tensor, and that
tensor's float32 host copy, which the C++ client reads Δ from and writes the
anchor into.

On CPU with float32 parameters the flat tensor is the host copy: the client
works on the parameters' own storage and nothing is copied. Otherwise (CUDA,
or bfloat16/float16 parameters) the host copy is a float32 mirror: a gather
copies the parameters into it, widening them, and a scatter copies it back,
rounding to the parameters' dtype. On CUDA the mirror is pinned and the copies
run on a stream of their own, ordered after the training stream's work and
before its next.
"""

from __future__ import annotations

from typing import List, Optional

import torch


# The parameter dtypes co2 trains; the anchor on the shards is float32.
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class HostParams:
    """Rebinds ``params`` (one dtype of DTYPES, on one device) to views of one
    flat tensor, ``flat``, in order. Code that holds a parameter keeps
    working; a tensor taken from ``p.data`` before this no longer aliases
    it."""

    def __init__(self, params: List[torch.Tensor]) -> None:
        self.numel = sum(p.numel() for p in params)
        self.device = params[0].device
        self._cuda = self.device.type == "cuda"
        self.dtype = params[0].dtype
        self._mirrored = self._cuda or self.dtype != torch.float32
        self.flat = torch.empty(self.numel, dtype=self.dtype, device=self.device)
        offset = 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                view = self.flat[offset:offset + n].view_as(p)
                view.copy_(p)
                p.data = view
                offset += n
        self._buffer: Optional[torch.Tensor] = None if self._mirrored else self.flat
        self._stream: Optional[torch.cuda.Stream] = None

    @property
    def buffer(self) -> torch.Tensor:
        """The float32 host copy (a mirror pinned on CUDA, made at first use:
        only the ranks that talk to the shards need one)."""
        if self._buffer is None:
            self._buffer = torch.empty(self.numel, dtype=torch.float32, pin_memory=self._cuda)
            if self._cuda:
                self._stream = torch.cuda.Stream(device=self.device)
        return self._buffer

    def view(self, begin: int, end: int) -> torch.Tensor:
        """Elements [begin, end) of the host copy."""
        return self.buffer[begin:end]

    @property
    def address(self) -> int:
        """The host copy's address, for the C++ client."""
        return self.buffer.data_ptr()

    def mirror_bytes(self) -> int:
        """Bytes of the host copy where it is a mirror (0: the parameters')."""
        return self.numel * 4 if self._mirrored and self._buffer is not None else 0

    def gather(self) -> None:
        """host copy ← the parameters (returns once it holds them)."""
        if not self._mirrored:
            return
        buffer = self.buffer
        if not self._cuda:
            buffer.copy_(self.flat)
            return
        assert self._stream is not None
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            buffer.copy_(self.flat, non_blocking=True)
        self._stream.synchronize()

    def scatter(self) -> None:
        """The parameters ← host copy (the training stream waits for the copy)."""
        if not self._mirrored:
            return
        buffer = self.buffer
        if not self._cuda:
            with torch.no_grad():
                self.flat.copy_(buffer)
            return
        assert self._stream is not None
        current = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(current)
        with torch.no_grad(), torch.cuda.stream(self._stream):
            self.flat.copy_(buffer, non_blocking=True)
        current.wait_stream(self._stream)
        # The pinned copy is rewritten by the next gather or exchange: the
        # copy out of it must be done by then.
        self._stream.synchronize()
