"""elastic_controller."""
