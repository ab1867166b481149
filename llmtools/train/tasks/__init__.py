"""Training tasks as plug-ins: the table below is the only place that maps ``task:`` to code.

Each task implements :class:`~llmtools.train.tasks.base.Task` (its data for a split, the loss of a
micro-batch, the metrics it adds, its client state). The trainer builds one with :func:`make_task`
and calls it; it never tests a task's name. A new task is a module here and a row in :data:`TASKS`: its own
section of the train config (``section``, ``section_type``, whose fields declare their resume rules) and
what it refuses on resume (``refuse_resumed_change``) come with its class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmtools.errors import InputError
from llmtools.train.tasks.base import (
    DataLedger,
    DataResume,
    LossOutput,
    RunContext,
    Task,
    TaskData,
    TokenScores,
    score_tokens,
)
from llmtools.train.tasks.dpo import DpoTask
from llmtools.train.tasks.pretrain import PretrainTask
from llmtools.train.tasks.sft import SftTask

if TYPE_CHECKING:
    from llmtools.train.config import TrainConfig

__all__ = [
    "TASKS",
    "DataLedger",
    "DataResume",
    "LossOutput",
    "RunContext",
    "Task",
    "TaskData",
    "TokenScores",
    "check_sections",
    "check_task",
    "make_task",
    "score_tokens",
    "task_sections",
]

TASKS: dict[str, type[Task]] = {task.name: task for task in (PretrainTask, SftTask, DpoTask)}


def check_task(value, where: str) -> str:
    """``task:`` of a train config: one of the table's names."""
    if value not in TASKS:
        raise InputError(f"{where}: task: {value!r} is not one of {', '.join(TASKS)}")
    return value


def task_sections() -> dict[str, type]:
    """The tasks' own sections of the train config: ``name -> section class``."""
    return {task.section: task.section_type for task in TASKS.values() if task.section is not None}


def check_sections(config: TrainConfig) -> None:
    """A task's own section of the train config (``dpo:``) is allowed only with that task."""
    for task in TASKS.values():
        if task.section and task.section in config.task_sections and config.task != task.name:
            raise InputError(
                f"{config.source or '<train config>'}: {task.section}: only with task: {task.name} "
                f"(this config has task: {config.task})"
            )


def make_task(config: TrainConfig) -> Task:
    """The task a (checked) train config names."""
    return TASKS[config.task](config)
