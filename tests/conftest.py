pytest_plugins = ["rebaser_core.testing"]
