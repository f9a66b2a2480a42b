"""The task-service demo: a task board, durable tasks, notifications and a DLQ on one log.

- :mod:`task_service.board`: the task board processor (tasks by category, live state);
- :mod:`task_service.service`: the ``create-task`` handler, the processors as
  the host runs them, and the ``streamkit.toml`` that runs them;
- :mod:`task_service.producer`: a producer process of the drill;
- :mod:`task_service.accounting`: the drill's books;
- :mod:`task_service.drill`: the drill (``python -m task_service.drill``).

``scripts/demo`` runs the drill; ``docs/tutorial.md`` builds the board from zero.
"""
