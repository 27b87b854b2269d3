"""The deploy gate's shared world (tests/support/deploy_world.py) for every module here."""

from tests.support.deploy_world import home, world  # noqa: F401
