"""Running a cell: work-sets, HTTP transport, dispatch of the arms, the cell driver."""
