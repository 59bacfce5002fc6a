"""The systems bench/peers trains, by the names run.py's rows and
worker.py's --system use: the peers, each through its own API, and co2's
settings (how worker.py sets each up)."""

PEER_SYSTEMS = ("ddp", "torchft-diloco", "torchft-streaming", "torchft-localsgd", "hivemind")
# co2: co2.Optimizer's defaults (the plain average, α = 1, with carried
# progress); co2-diloco: its DiLoCo (a check of the harness against
# torchft's); co2-a0.5: α = 0.5 without carried progress; co2-nocarry and
# co2-a0.5-carry: α = 1 alone and carried progress alone; co2-int8: the
# defaults with an int8 exchange both ways; co2-localsgd: its blocking
# LocalSGD (a check against torchft's); co2-by1 and co2-boundary: the
# defaults with each update applied by the round's first step, and at its
# boundary.
CO2_SYSTEMS = ("co2", "co2-diloco", "co2-a0.5", "co2-nocarry", "co2-a0.5-carry", "co2-int8",
               "co2-localsgd", "co2-by1", "co2-boundary")
SYSTEMS = PEER_SYSTEMS + CO2_SYSTEMS
