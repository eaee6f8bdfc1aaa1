print("keyhold")
