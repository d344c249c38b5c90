from ragent_memory.cli.main import main

main()
