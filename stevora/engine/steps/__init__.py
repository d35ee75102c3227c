"""The step-type seam: one module per step type, registered in `registry.py`.

The run driver only knows the `StepType` protocol (`base.py`); adding a step type means a model
in `stevora.definitions` and a module here, nothing in the driver. Each module tells the whole
story of its type: how it executes, what it writes when it starts waiting (a `WaitPlan`), what a
due wait means, and how its wait is answered. Tool calls answered from outside the `llm` loop are
in `awaited/`, one module per kind, registered in `awaited_kinds.py`.
"""
