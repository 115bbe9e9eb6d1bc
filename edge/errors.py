"""Errors of the device agent that the command line reports in one line (kept free of heavy
imports: ``trickle edge --help`` should not load the MQTT and HTTP stacks)."""


class AgentError(ValueError):
    """A configuration or input the agent cannot start with."""
