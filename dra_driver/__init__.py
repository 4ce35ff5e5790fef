"""dra_driver."""
