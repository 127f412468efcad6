"""Pipelining: schedules as per-rank action lists (``schedules``), their checking, global order
and timing (``analysis``), and the stage partition of a model's layer calls (``partition``).

Nothing is imported here: import the module you need.
"""
