"""HostParams: the model's parameters as one flat float32 buffer in host memory.

The C++ client reads Δ from, and writes the anchor into, this buffer. For CPU
parameters it is a plain tensor; for CUDA parameters it is pinned, and the
copies between the device and it run on a stream of their own, ordered after
the training stream's work and before its next.
"""

from __future__ import annotations

from typing import List, Optional

import torch


class HostParams:
    """One flat host copy of ``params`` (all float32, on one device)."""

    def __init__(self, params: List[torch.Tensor]) -> None:
        self._params = params
        self.numel = sum(p.numel() for p in params)
        self.device = params[0].device
        self._cuda = self.device.type == "cuda"
        self.buffer = torch.empty(self.numel, dtype=torch.float32,
                                  pin_memory=self._cuda)
        self._stream: Optional[torch.cuda.Stream] = None
        self._device_flat: Optional[torch.Tensor] = None
        if self._cuda:
            self._stream = torch.cuda.Stream(device=self.device)
            self._device_flat = torch.empty(self.numel, dtype=torch.float32,
                                            device=self.device)

    def _pairs(self, flat: torch.Tensor):
        """(parameter, its slice of `flat` shaped like it), in order."""
        offset = 0
        for p in self._params:
            n = p.numel()
            yield p, flat[offset:offset + n].view_as(p)
            offset += n

    @property
    def address(self) -> int:
        """The buffer's address, for the C++ client."""
        return self.buffer.data_ptr()

    def gather(self) -> None:
        """buffer ← the parameters (returns once the buffer holds them)."""
        with torch.no_grad():
            if not self._cuda:
                for p, view in self._pairs(self.buffer):
                    view.copy_(p)
                return
            assert self._stream is not None and self._device_flat is not None
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._stream):
                for p, view in self._pairs(self._device_flat):
                    view.copy_(p)
                self.buffer.copy_(self._device_flat, non_blocking=True)
            self._stream.synchronize()

    def scatter(self) -> None:
        """The parameters ← buffer (the training stream waits for the copy)."""
        with torch.no_grad():
            if not self._cuda:
                for p, view in self._pairs(self.buffer):
                    p.copy_(view)
                return
            assert self._stream is not None and self._device_flat is not None
            current = torch.cuda.current_stream(self.device)
            self._stream.wait_stream(current)
            with torch.cuda.stream(self._stream):
                self._device_flat.copy_(self.buffer, non_blocking=True)
                for p, view in self._pairs(self._device_flat):
                    p.copy_(view)
            current.wait_stream(self._stream)
            # The pinned buffer is rewritten by the next gather or exchange:
            # the copy out of it must be done by then.
            self._stream.synchronize()
