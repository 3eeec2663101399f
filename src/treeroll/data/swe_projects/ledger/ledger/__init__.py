"""Accounts, inventory and pricing."""
