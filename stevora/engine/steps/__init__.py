"""The step-type seam: one module per step type, registered in `registry.py`.

The run driver only knows the `StepType` protocol (`base.py`); adding a step type means a model
in `stevora.definitions` and a module here, nothing in the driver.
"""
