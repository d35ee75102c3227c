"""The worker edge: Dramatiq actors (ids in, call the engine) and the worker process entrypoint.

This is the only place with process globals: the runtime that the actors of this process use.
"""
