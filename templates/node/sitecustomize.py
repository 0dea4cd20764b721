# Loaded by every Python process of a job started by mgpu-cloud (its folder is first on
# PYTHONPATH): SIGUSR2 makes the process write all its threads' stacks to stderr, which is how
# `remote.pyz stacks` shows where a hung rank is when py-spy is not installed.
import faulthandler
import signal
import sys

faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True, chain=False)
