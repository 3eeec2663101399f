"""Graphs and graph algorithms."""
