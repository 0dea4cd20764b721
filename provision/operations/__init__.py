"""The operations layer: day-2 views and actions over clusters and jobs (status, monitor,
scale; the CLI's day-2 commands render them). Imports the layers below it, never the CLI.
"""
