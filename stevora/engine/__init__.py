"""The run and step state machines, step executors, retries, recovery and commands."""
