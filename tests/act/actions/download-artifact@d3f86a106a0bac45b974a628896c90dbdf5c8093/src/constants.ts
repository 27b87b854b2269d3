export enum Inputs {
  Name = 'name',
  Path = 'path',
  GitHubToken = 'github-token',
  Repository = 'repository',
  RunID = 'run-id',
  Pattern = 'pattern',
  MergeMultiple = 'merge-multiple',
  ArtifactIds = 'artifact-ids'
}

export enum Outputs {
  DownloadPath = 'download-path'
}
