"""Lead intake, qualification and delivery appliance."""

__version__ = "0.1.0"
