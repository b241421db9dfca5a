"""Module-level functions the pool tests run in worker processes."""
import ctypes
import os
import time


def add(a, b):
    return a + b


def sleep(seconds):
    time.sleep(seconds)


def exit_hard():
    os._exit(7)


def segfault():
    ctypes.string_at(0)


def fail(message):
    raise ValueError(message)


def pid_after(seconds):
    """Sleep, then say which worker ran the item (placement assertions)."""
    time.sleep(seconds)
    return os.getpid()
