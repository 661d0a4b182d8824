"""Pricing a configuration a person wrote: cost it with the search's model, emit its plan.

Beside ``autoplan.solve`` rather than inside it: nothing here searches, and it reads the solve
step's cost model and emitter (``autoplan.solve.cost_model``, ``autoplan.solve.emit``) the way
``autoplan cost``, ``autoplan validate --profile``, the API and calibration use them.
"""
