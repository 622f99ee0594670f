"""The project's tests, by wing: ``analysing/`` (no torch: CI also runs them where torch is not installed),
``measuring/`` (torch and transformers) and ``suite/`` (``pytest benchmarks`` end to end, the faces).
Importing this file puts ``tests/`` on the path, so ``fakerun`` and ``kvrun`` import from any of them."""

import signal

# A shell that starts a job in the background without job control (``make test &`` in a script, ``nohup``) makes it
# ignore SIGINT, and every process it starts inherits that. The tests of Ctrl-C (in this process and in the suite's
# subprocesses) need SIGINT as a terminal delivers it: Python's own handler here, the default in each child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
