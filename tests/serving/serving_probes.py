"""Probe samples shared by the serving tests: three lengths, ids inside every bundled vocabulary (< 256)."""

PROBES: list[list[int]] = [
    [1, 51, 71, 68, 220, 66, 64, 79, 72, 83, 64, 75],
    [1, 10, 20, 30, 40],
    [1, 7, 7, 7, 7, 7, 7, 9, 200],
]
