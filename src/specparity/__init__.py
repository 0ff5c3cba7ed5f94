"""specparity: train/serve parity gate for EAGLE-3 drafters.

The drafter's ``fc`` layer consumes hidden states taken from chosen layers of the target model.
specparity records, at training time, exactly which ones (a :class:`~specparity.contract.Contract`),
then checks what SGLang really feeds ``fc`` at serving time, chunk by chunk.
"""

__version__ = "0.1.0"
