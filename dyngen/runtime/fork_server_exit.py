"""Preloaded first by `dyngen serve`'s fork server: it ends at once when serve stops.

Its children (the rounds) leave through `os._exit` as multiprocessing makes them, so this
only shortens the fork server's own exit (see dyngen.runtime.quick_exit).
"""

from dyngen.runtime.quick_exit import exit_after_cleanup, exit_quickly

exit_quickly()
exit_after_cleanup()
