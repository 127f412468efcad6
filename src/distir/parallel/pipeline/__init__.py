"""Pipelining: schedules as per-rank action lists (``schedules``), their checking, global order
and timing (``analysis``), the stage partition of a model's layer calls (``partition``),
DeepSpeed's engine's schedule (``deepspeed``) and what ``torch.distributed.pipelining``'s stages
keep through a step (``stage_state``).

Nothing is imported here: import the module you need.
"""
