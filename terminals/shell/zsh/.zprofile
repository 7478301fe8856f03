__tether_source .zprofile
