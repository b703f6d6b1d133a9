from hetsgd.cli import main

main()
