"""The deploy gate: reading deploy configs and matching their cells to certs."""
