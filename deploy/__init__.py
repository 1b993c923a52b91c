"""Deploying Megha's services: a whole local deployment as separate processes (`megha local`), and cloud VMs."""
