"""One module per op: the device launcher and its numpy reference side by side.

Each module also registers the op's host implementation with the cpu backend, so the same
launcher runs on every device. Beside them, kernel_choice.py decides which op (and which of its one-launch
paths) each product of a step takes, and reads the ROCMFORGE_* switches.
"""
