"""Other engines run by the bench harness beside loosespec's methods."""
