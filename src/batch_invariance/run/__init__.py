"""The cell driver: HTTP transport, dispatch of the arms, the C passes, the records of a cell,
over any :class:`~batch_invariance.run.cell.ServerLauncher`."""
